//! What a command prints on stdout: one compact JSON document, or text lines. With noise on,
//! a JSON document is preceded by the stray line the real CLI sometimes prints, so clients
//! prove they parse the first `{`/`[` document rather than the whole of stdout.

use serde::Serialize;
use std::io::Write;

pub const UPDATE_NOTICE: &str = "A new version of boxd is available (v0.2.21). Update with: \
curl -fsSL https://boxd.sh/downloads/cli/install.sh | sh";
pub const STRAY_LINE: &str = "(restarted client-utilities daemon)";

pub struct Out {
    pub json: bool,
    pub noise: bool,
    /// Print nothing: a command that acts, then fails (the `fail` fault with `land`).
    pub discard: bool,
}

impl Out {
    pub fn new(json: bool, noise: bool) -> Self {
        Out { json, noise, discard: false }
    }

    /// One JSON document on its own line (a closed stdout is the reader's business).
    pub fn doc<T: Serialize>(&self, value: &T) {
        if self.discard {
            return;
        }
        let mut s = std::io::stdout().lock();
        if self.noise {
            let _ = writeln!(s, "{STRAY_LINE}");
        }
        let _ = serde_json::to_writer(&mut s, value);
        let _ = writeln!(s);
        let _ = s.flush();
    }

    pub fn line(&self, text: &str) {
        if self.discard {
            return;
        }
        let mut s = std::io::stdout().lock();
        let _ = writeln!(s, "{text}");
    }

    /// `value` as JSON under `--json`, else the text (nothing when it is empty).
    pub fn either<T: Serialize>(&self, value: &T, text: impl FnOnce() -> String) {
        if self.json {
            self.doc(value);
        } else {
            let t = text();
            if !t.is_empty() {
                self.line(&t);
            }
        }
    }
}
