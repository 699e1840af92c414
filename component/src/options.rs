//! The plugin options and the host context they arrive in. Validation lives here, so
//! every host gets the same OPTIONS_INVALID naming the same field.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{micros, Prices};
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
    /// The most machines running at once (running, starting or standby) per ledger, per
    /// project and per boxd account (counting `oc-` machines only).
    pub max_running: Caps,
    pub prices: Prices,
    /// Millionths per hour across the ledger's running machines; None: no ceiling.
    pub burn_rate_ceiling: Option<u64>,
    /// Millionths one work may spend before its machine is no longer created or woken.
    pub work_spend_ceiling: Option<u64>,
    /// A work older than this takes no more prompts; None: no limit.
    pub max_lifetime_hours: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub ledger: u32,
    pub project: u32,
    pub account: u32,
}

pub const DEFAULT_CAPS: Caps = Caps { ledger: 6, project: 4, account: 10 };
/// 1.50 an hour: the six machines of the ledger cap at boxd's default size (1.308).
pub const DEFAULT_BURN_RATE_CEILING: u64 = 1_500_000;
/// 20.00: about 90 running hours of one default-size machine.
pub const DEFAULT_WORK_SPEND_CEILING: u64 = 20_000_000;

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
            max_running: DEFAULT_CAPS,
            prices: Prices::default(),
            burn_rate_ceiling: Some(DEFAULT_BURN_RATE_CEILING),
            work_spend_ceiling: Some(DEFAULT_WORK_SPEND_CEILING),
            max_lifetime_hours: None,
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

    pub fn idle_ms(&self) -> u64 {
        self.idle_seconds() as u64 * 1000
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
                "maxRunningPerLedger" => o.max_running.ledger = cap(key, v)?,
                "maxRunningPerProject" => o.max_running.project = cap(key, v)?,
                "maxRunningPerAccount" => o.max_running.account = cap(key, v)?,
                "prices" => o.prices = prices(key, v)?,
                "burnRateCeiling" => o.burn_rate_ceiling = money_or_off(key, v)?,
                "workSpendCeiling" => o.work_spend_ceiling = money_or_off(key, v)?,
                "maxLifetimeHours" => {
                    o.max_lifetime_hours = match v {
                        Value::Null => None,
                        _ => Some(v.as_u64().filter(|n| (1..=8760).contains(n)).ok_or_else(|| invalid(key, "must be null or a whole number of hours from 1 to 8760"))? as u32),
                    };
                }
                other => return Err(invalid(other, "is not a known option")),
            }
        }
        Ok(o)
    }
}

fn cap(key: &str, v: &Value) -> ToolResult<u32> {
    Ok(v.as_u64().filter(|n| (1..=1000).contains(n)).ok_or_else(|| invalid(key, "must be a whole number of machines from 1 to 1000"))? as u32)
}

fn money(key: &str, v: &Value) -> ToolResult<u64> {
    v.as_f64().and_then(micros).ok_or_else(|| invalid(key, "must be a number of at least 0"))
}

fn money_or_off(key: &str, v: &Value) -> ToolResult<Option<u64>> {
    if v.is_null() { Ok(None) } else { money(key, v).map(Some) }
}

/// `prices`: any of its keys overrides the default table's; a size row may be added.
fn prices(key: &str, v: &Value) -> ToolResult<Prices> {
    let map = v.as_object().ok_or_else(|| invalid(key, "must be an object (runningPerHour, asleepPerGbHour, storedGb)"))?;
    let mut p = Prices::default();
    for (k, v) in map {
        match k.as_str() {
            "runningPerHour" => {
                let rows = v.as_object().ok_or_else(|| invalid("prices.runningPerHour", "must map sizes (\"2x8\") to prices per hour"))?;
                for (size, price) in rows {
                    p.running_per_hour.insert(size.clone(), money("prices.runningPerHour", price)?);
                }
            }
            "asleepPerGbHour" => p.asleep_per_gb_hour = money("prices.asleepPerGbHour", v)?,
            "storedGb" => p.stored_gb = v.as_u64().filter(|n| *n <= 100_000).ok_or_else(|| invalid("prices.storedGb", "must be a whole number of GB"))?,
            other => return Err(invalid(&format!("prices.{other}"), "is not a known price")),
        }
    }
    Ok(p)
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
    /// Agents that lack the default permission rules.
    pub agents_without_rules: Vec<String>,
    /// The rules the plugin adds to an agent (a JSON object), for those that lack them.
    pub default_rules_json: String,
    /// The agent making the call, when OpenCode says.
    pub agent: Option<String>,
    /// That agent's evaluated rule per tool; empty when unknown.
    pub tool_rules: Vec<ToolRule>,
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
        let oc = ["agentsWithoutRules", "rulesNotAdded", "skillsInvalid", "toolRules"].iter().any(|k| v.get(k).is_some());
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
                default_rules_json: v.get("defaultRules").map(Value::to_string).unwrap_or_default(),
                agent: v.get("agent").and_then(Value::as_str).map(String::from),
                tool_rules: v
                    .get("toolRules")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(tool, action)| ToolRule {
                        tool: tool.clone(),
                        action: action.as_str().unwrap_or_default().trim_end_matches(" hidden").to_string(),
                        hidden: action.as_str().is_some_and(|a| a.ends_with(" hidden")),
                    })
                    .collect(),
            }),
        }
    }
}

/// One tool's permission for the calling agent, as OpenCode evaluates it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolRule {
    pub tool: String,
    /// "allow", "ask" or "deny".
    pub action: String,
    /// OpenCode does not offer the tool to the agent's model at all.
    pub hidden: bool,
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
            (r#"{"maxRunningPerProject":0}"#, "'maxRunningPerProject'"),
            (r#"{"burnRateCeiling":-1}"#, "'burnRateCeiling'"),
            (r#"{"prices":{"runningPerHour":{"2x8":"cheap"}}}"#, "'prices.runningPerHour'"),
            (r#"{"prices":{"perMonth":1}}"#, "'prices.perMonth'"),
            (r#"{"maxLifetimeHours":0}"#, "'maxLifetimeHours'"),
        ] {
            let e = Options::parse(json).unwrap_err();
            assert_eq!(e.code, Code::OptionsInvalid);
            assert!(e.message.contains(field), "{json}: {}", e.message);
        }
    }

    #[test]
    fn admission_options_override_the_defaults_and_null_turns_a_ceiling_off() {
        let o = Options::parse(r#"{"maxRunningPerAccount":3,"prices":{"runningPerHour":{"2x8":0.5},"storedGb":20},"burnRateCeiling":null,"workSpendCeiling":2.5,"maxLifetimeHours":48}"#).unwrap();
        assert_eq!(o.max_running, Caps { account: 3, ..DEFAULT_CAPS });
        assert_eq!((o.prices.running_rate("2x8"), o.prices.running_rate("1x4"), o.prices.asleep_rate()), (500_000, 109_000, 2_000));
        assert_eq!((o.burn_rate_ceiling, o.work_spend_ceiling, o.max_lifetime_hours), (None, Some(2_500_000), Some(48)));
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
