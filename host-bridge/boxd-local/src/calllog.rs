//! The call log: one JSON line per invocation in `calls.jsonl` — start time, argv (without
//! the program name), exit code, duration, and the fault that fired, if any — so tests and
//! benchmarks count round trips. stdin is never logged.

use crate::store::Home;
use serde::Serialize;
use std::io::Write;

#[derive(Serialize)]
pub struct Line<'a> {
    pub t: u64,
    pub argv: &'a [String],
    pub exit_code: i32,
    /// `null` only for a fault that hangs forever (its line is written before hanging).
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<&'static str>,
}

/// Append one line. One `write` on an O_APPEND file, so parallel invocations never
/// interleave; a log failure never changes the command's outcome.
pub fn append(home: &Home, line: &Line) {
    let Ok(mut buf) = serde_json::to_vec(line) else { return };
    buf.push(b'\n');
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(home.path("calls.jsonl")) {
        let _ = f.write_all(&buf);
    }
}
