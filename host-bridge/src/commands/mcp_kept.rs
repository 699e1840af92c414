//! The answer of a call its client cancelled (notifications/cancelled, most often a client
//! timeout) after it had started: it runs to its end (mcp.rs says why) and rmcp drops its
//! answer. A client that then asks the same again, as a timed-out client does, would run a
//! change twice: a submit's prompt twice over the files it changed. So the answer of a
//! cancelled change call is kept, and the very next change call, if it is the same tool
//! with the same arguments within `KEPT_FOR`, gets it instead of running. Any other change
//! call drops it (what it answered may no longer be true); reads leave it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Longer than any client waits before it retries.
pub const KEPT_FOR: Duration = Duration::from_secs(600);

struct Answer {
    tool: String,
    args: String,
    answer: Value,
    at: Instant,
}

#[derive(Default)]
pub struct Kept(Mutex<Option<Answer>>);

impl Kept {
    /// Keep the answer of the cancelled change call `tool(args)`.
    pub fn keep(&self, tool: &str, args: &str, answer: &Value) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Answer { tool: tool.into(), args: args.into(), answer: answer.clone(), at: Instant::now() });
    }

    /// At a change call's turn: the kept answer if this call asks exactly what the cancelled
    /// one did, within KEPT_FOR, marked so (`answeredBefore`). Whatever was kept goes.
    pub fn take(&self, tool: &str, args: &str) -> Option<Value> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        if kept.tool != tool || kept.args != args || kept.at.elapsed() > KEPT_FOR {
            return None;
        }
        let mut answer = kept.answer;
        if let Some(o) = answer.as_object_mut() {
            o.insert("answeredBefore".into(), Value::String("this call's first try ran to its end after its client cancelled it; this is that try's answer, not a second run".into()));
        }
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_very_next_identical_change_call_gets_a_cancelled_calls_answer() {
        let kept = Kept::default();
        kept.keep("submit", r#"{"work":"w1","prompt":"go"}"#, &json!({ "promptId": "p1" }));
        assert_eq!(kept.take("submit", r#"{"work":"w1","prompt":"go"}"#).unwrap()["promptId"], "p1");
        assert!(kept.take("submit", r#"{"work":"w1","prompt":"go"}"#).is_none(), "once");
        // Another change call in between: the answer may no longer be true, and goes.
        kept.keep("submit", r#"{"work":"w1","prompt":"go"}"#, &json!({ "promptId": "p1" }));
        assert!(kept.take("drop", r#"{"work":"w1"}"#).is_none());
        assert!(kept.take("submit", r#"{"work":"w1","prompt":"go"}"#).is_none());
        // Other arguments are another call.
        kept.keep("submit", r#"{"work":"w1","prompt":"go"}"#, &json!({ "promptId": "p1" }));
        assert!(kept.take("submit", r#"{"work":"w1","prompt":"go on"}"#).is_none());
    }
}
