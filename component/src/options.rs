//! The plugin options and the host context they arrive in. Validation lives here, so
//! every host gets the same OPTIONS_INVALID naming the same field.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::errors::{Code, ToolError, ToolResult};
use crate::paths;

/// The `access` option: who may change machines. Reads always run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessOption {
    All,
    AskChanges,
    ReadOnly,
}

impl AccessOption {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessOption::All => "all",
            AccessOption::AskChanges => "ask-changes",
            AccessOption::ReadOnly => "read-only",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub snapshot: String,
    pub allowed_roots: Vec<String>,
    pub access: AccessOption,
    pub allow_untested_host: bool,
    /// The idle bound boxd gets when we create or wake a machine.
    pub idle_minutes: u32,
    /// Only the host uses it (to choose the ledger preopen); validated here.
    pub ledger_dir: Option<String>,
    /// How long one boxd CLI call may take before it counts as TIMEOUT.
    pub boxd_timeout_seconds: u32,
    /// Harvest also fetches a work's commits into the project's repository as
    /// `refs/boxd/<work>` (off by default: the plugin writes nothing into a repository
    /// unless asked; the bundle in the ledger already keeps every commit).
    pub fetch_commits: bool,
}

pub const DEFAULT_SNAPSHOT: &str = "opencode-golden";
pub const DEFAULT_IDLE_MINUTES: u32 = 30;
pub const DEFAULT_BOXD_TIMEOUT_SECONDS: u32 = 120;

impl Default for Options {
    fn default() -> Self {
        Self {
            snapshot: DEFAULT_SNAPSHOT.to_string(),
            allowed_roots: Vec::new(),
            access: AccessOption::All,
            allow_untested_host: false,
            idle_minutes: DEFAULT_IDLE_MINUTES,
            ledger_dir: None,
            boxd_timeout_seconds: DEFAULT_BOXD_TIMEOUT_SECONDS,
            fetch_commits: false,
        }
    }
}

fn invalid(field: &str, why: &str) -> ToolError {
    ToolError::with_next(
        Code::OptionsInvalid,
        format!("plugin option '{field}' {why}"),
        format!("Fix '{field}' in the plugin options (docs/configuration.md lists them), then restart the host."),
    )
}

impl Options {
    /// The idle bound in the unit boxd takes.
    pub fn idle_seconds(&self) -> u32 {
        self.idle_minutes * 60
    }

    /// Parse the options object a host passes. Unknown keys are refused, so a typo is
    /// never silently ignored.
    pub fn parse(json: &str) -> ToolResult<Options> {
        let value: Value = if json.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(json).map_err(|_| invalid("(options)", "is not valid JSON"))?
        };
        let Value::Object(map) = value else {
            return Err(invalid("(options)", "must be a JSON object"));
        };
        let mut o = Options::default();
        for (key, v) in &map {
            match key.as_str() {
                "snapshot" => {
                    let s = v.as_str().ok_or_else(|| invalid(key, "must be a string"))?;
                    if !paths::is_snapshot_name(s) {
                        return Err(invalid(key, "must be a lowercase name of [a-z0-9-] starting with a letter"));
                    }
                    o.snapshot = s.to_string();
                }
                "allowedRoots" => {
                    let list = v.as_array().ok_or_else(|| invalid(key, "must be an array of absolute folder paths"))?;
                    for item in list {
                        let s = item.as_str().ok_or_else(|| invalid(key, "must hold strings"))?;
                        let p = paths::clean_absolute(s).ok_or_else(|| invalid(key, "must hold absolute paths without '..'"))?;
                        o.allowed_roots.push(p);
                    }
                }
                "access" => {
                    o.access = match v.as_str() {
                        Some("all") => AccessOption::All,
                        Some("ask-changes") => AccessOption::AskChanges,
                        Some("read-only") => AccessOption::ReadOnly,
                        _ => return Err(invalid(key, "must be \"all\", \"ask-changes\" or \"read-only\"")),
                    };
                }
                "allowUntestedHost" => {
                    o.allow_untested_host = v.as_bool().ok_or_else(|| invalid(key, "must be true or false"))?;
                }
                "idleMinutes" => {
                    let n = v.as_u64().filter(|n| (1..=1440).contains(n));
                    o.idle_minutes = n.ok_or_else(|| invalid(key, "must be a whole number of minutes from 1 to 1440"))? as u32;
                }
                "ledgerDir" => {
                    let s = v.as_str().ok_or_else(|| invalid(key, "must be a string"))?;
                    let p = paths::clean_absolute(s).ok_or_else(|| invalid(key, "must be an absolute path without '..'"))?;
                    o.ledger_dir = Some(p);
                }
                "boxdTimeoutSeconds" => {
                    let n = v.as_u64().filter(|n| (5..=3600).contains(n));
                    o.boxd_timeout_seconds = n.ok_or_else(|| invalid(key, "must be a whole number of seconds from 5 to 3600"))? as u32;
                }
                "fetchCommits" => {
                    o.fetch_commits = v.as_bool().ok_or_else(|| invalid(key, "must be true or false"))?;
                }
                other => return Err(invalid(other, "is not a known option")),
            }
        }
        Ok(o)
    }
}

/// What the host tells the component about one call.
#[derive(Clone, Debug)]
pub struct Context {
    pub host_name: String,
    pub host_version: String,
    pub options: Options,
    pub project: String,
    pub ledger: String,
    pub now_ms: u64,
    /// Random bytes from the host (see the WIT context).
    pub entropy: Vec<u8>,
    pub facts: HostFacts,
}

/// Facts only a host knows (the WIT context's typed fields). A host that cannot know one
/// leaves it out; the ones only the OpenCode bridge knows are empty elsewhere.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    /// The user approved this call (a host asked, or the command line is the approval).
    pub approved: bool,
    /// The laptop's OpenCode version, when the host knows it.
    pub opencode_version: Option<String>,
    /// The OpenCode bridge's own facts: present only when the host is OpenCode.
    pub opencode: Option<OpencodeFacts>,
}

/// What the OpenCode bridge knows about the user's OpenCode configuration.
#[derive(Clone, Debug, Default)]
pub struct OpencodeFacts {
    /// Agents that lack the default permission rules, with the reason.
    pub agents_without_rules: Vec<String>,
    /// The host could not add the default rules (RULES_NOT_ADDED).
    pub rules_not_added: bool,
    /// Why the host's copy of the plugin's skill is unusable (SKILLS_INVALID).
    pub skills_invalid: Option<String>,
}

#[cfg(test)]
impl HostFacts {
    /// Tests write facts as the JSON the hosts once passed: {"approved":true, …}.
    pub fn from_json(json: &str) -> HostFacts {
        let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
        let oc = ["agentsWithoutRules", "rulesNotAdded", "skillsInvalid"].iter().any(|k| v.get(k).is_some());
        HostFacts {
            approved: v.get("approved").and_then(Value::as_bool).unwrap_or(false),
            opencode_version: v.get("opencodeVersion").and_then(Value::as_str).map(String::from),
            opencode: oc.then(|| OpencodeFacts {
                agents_without_rules: v
                    .get("agentsWithoutRules")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
                    .unwrap_or_default(),
                rules_not_added: v.get("rulesNotAdded").and_then(Value::as_bool).unwrap_or(false),
                skills_invalid: v.get("skillsInvalid").and_then(Value::as_str).map(String::from),
            }),
        }
    }
}

/// The OpenCode versions our own tests run: the host gate's tested range.
pub const TESTED_OPENCODE: (&str, &str) = ("1.18.0", "1.19.0");

/// Whether `version` lies in [low, high) by numeric major.minor.patch.
pub fn in_tested_range(version: &str) -> bool {
    fn parse(v: &str) -> Option<(u32, u32, u32)> {
        let core = v.trim().trim_start_matches('v').split(['-', '+']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
        Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
    }
    match (parse(version), parse(TESTED_OPENCODE.0), parse(TESTED_OPENCODE.1)) {
        (Some(v), Some(lo), Some(hi)) => v >= lo && v < hi,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_empty() {
        let o = Options::parse("{}").unwrap();
        assert_eq!(o, Options::default());
        assert_eq!(o.snapshot, "opencode-golden");
        assert_eq!(o.access, AccessOption::All);
    }

    #[test]
    fn each_bad_field_is_named() {
        for (json, field) in [
            (r#"{"access":"sometimes"}"#, "'access'"),
            (r#"{"snapshot":"Golden"}"#, "'snapshot'"),
            (r#"{"allowedRoots":["relative/dir"]}"#, "'allowedRoots'"),
            (r#"{"allowUntestedHost":"yes"}"#, "'allowUntestedHost'"),
            (r#"{"idleMinutes":0}"#, "'idleMinutes'"),
            (r#"{"snapshott":"x"}"#, "'snapshott'"),
        ] {
            let e = Options::parse(json).unwrap_err();
            assert_eq!(e.code, Code::OptionsInvalid);
            assert!(e.message.contains(field), "{json}: {}", e.message);
        }
    }

    #[test]
    fn tested_range_is_our_own() {
        assert!(in_tested_range("1.18.33"));
        assert!(in_tested_range("1.18.0"));
        assert!(!in_tested_range("1.19.5"));
        assert!(!in_tested_range("2.2.3"));
        assert!(!in_tested_range("garbage"));
    }
}
