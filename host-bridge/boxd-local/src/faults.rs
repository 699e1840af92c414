//! Fault injection for tests: rules from `$BOXD_LOCAL_HOME/faults.json` (first) and env
//! `BOXD_LOCAL_FAULTS` (then), matched on the canonical verb. The first matching rule with
//! uses left fires; each firing consumes one of its `times`, under the state lock, so
//! parallel invocations never spend a rule twice. What each action does lives in `app`.

use crate::fail::{Fail, Res};
use crate::store::Locked;
use crate::util;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Hang,
    Fail,
    Garbage,
    BootTimeout,
    LoseMachine,
    SignedOut,
    Network,
    Delay,
    Flood,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Hang => "hang",
            Action::Fail => "fail",
            Action::Garbage => "garbage",
            Action::BootTimeout => "boot_timeout",
            Action::LoseMachine => "lose_machine",
            Action::SignedOut => "signed_out",
            Action::Network => "network",
            Action::Delay => "delay",
            Action::Flood => "flood",
        }
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Canonical verb (`machine new`, `machine list`, …) or `*` for any.
    pub verb: String,
    /// Absent: fires every time.
    #[serde(default)]
    pub times: Option<u64>,
    pub action: Action,
    #[serde(default)]
    pub ms: Option<u64>,
    #[serde(default)]
    pub land: bool,
    #[serde(default)]
    pub appear_after_ms: u64,
    #[serde(default)]
    pub starting_ms: u64,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub message: Option<String>,
    /// Only invocations naming this machine match (verbs that name none still do);
    /// for `lose_machine`, the machine that vanishes.
    #[serde(default)]
    pub machine: Option<String>,
    /// `garbage`: what to print instead of the default.
    #[serde(default)]
    pub output: Option<String>,
    /// `flood`: how many bytes (default 80 MiB, past every cap a host sets on stdout).
    #[serde(default)]
    pub bytes: Option<u64>,
    /// `flood`: `stdout` (default) or `stderr`.
    #[serde(default)]
    pub stream: Option<String>,
}

impl Rule {
    fn matches(&self, verb: &str, target: Option<&str>) -> bool {
        (self.verb == "*" || self.verb == verb)
            && match (&self.machine, target) {
                (Some(m), Some(t)) => m == t,
                _ => true,
            }
    }
}

fn parse_rule(where_: &str, v: &Value) -> Res<Rule> {
    serde_json::from_value(v.clone()).map_err(|e| Fail::new(format!("{where_}: bad fault rule {v}: {e}")))
}

fn parse_list(where_: &str, text: &[u8]) -> Res<Vec<Value>> {
    match serde_json::from_slice::<Value>(text) {
        Ok(Value::Array(list)) => Ok(list),
        Ok(_) => Err(Fail::new(format!("{where_} must hold a JSON list of fault rules"))),
        Err(e) => Err(Fail::new(format!("{where_} is not valid JSON: {e}"))),
    }
}

/// Find, consume and return the rule that fires for this invocation, if any.
pub fn take(lock: &mut Locked, verb: &str, target: Option<&str>) -> Res<Option<Rule>> {
    let path = lock.home.path("faults.json");
    match std::fs::read(&path) {
        Ok(bytes) => {
            // Only `times` changes; the rest of the document is written back as read.
            let mut list = parse_list("faults.json", &bytes)?;
            for i in 0..list.len() {
                let rule = parse_rule("faults.json", &list[i])?;
                if !rule.matches(verb, target) || rule.times == Some(0) {
                    continue;
                }
                if let Some(t) = rule.times {
                    list[i]["times"] = Value::from(t - 1);
                    let bytes = serde_json::to_vec_pretty(&list).unwrap_or_default();
                    util::write_atomic(&path, &bytes)?;
                }
                return Ok(Some(rule));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Fail::io("reading faults.json", e)),
    }
    let Some(text) = std::env::var("BOXD_LOCAL_FAULTS").ok().filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    for (i, v) in parse_list("BOXD_LOCAL_FAULTS", text.as_bytes())?.iter().enumerate() {
        let rule = parse_rule("BOXD_LOCAL_FAULTS", v)?;
        if !rule.matches(verb, target) {
            continue;
        }
        // An env var cannot be rewritten: its uses are counted in state.json.
        let key = format!("env#{i} {v}");
        let used = lock.state.fault_uses.get(&key).copied().unwrap_or(0);
        if let Some(t) = rule.times {
            if used >= t {
                continue;
            }
            lock.state.fault_uses.insert(key, used + 1);
            lock.save()?;
        }
        return Ok(Some(rule));
    }
    Ok(None)
}
