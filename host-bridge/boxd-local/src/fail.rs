//! The one failure type. A failure prints one `error: …` line on stderr (usage errors add a
//! hint line) and carries its exit code; `app` is the only place that prints it.

use std::fmt::Display;

#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub message: String,
    pub hint: Option<String>,
}

pub type Res<T> = Result<T, Fail>;

impl Fail {
    pub fn new(message: impl Into<String>) -> Self {
        Fail { code: 1, message: message.into(), hint: None }
    }

    pub fn with_code(code: i32, message: impl Into<String>) -> Self {
        Fail { code, message: message.into(), hint: None }
    }

    /// A command-line mistake: still exit 1, plus a line saying what to type instead.
    pub fn usage(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Fail { code: 1, message: message.into(), hint: Some(hint.into()) }
    }

    pub fn not_found(name: &str) -> Self {
        Fail::new(format!("VM '{name}' not found"))
    }

    pub fn exists(name: &str) -> Self {
        Fail::new(format!("VM '{name}' already exists"))
    }

    /// An I/O failure, named by what we were doing.
    pub fn io(doing: impl Display, e: std::io::Error) -> Self {
        Fail::new(format!("{doing}: {e}"))
    }
}
