//! Standard output for the commands. `println!` panics when the reader has gone away
//! (`boxd-host describe | head`); here a closed pipe only drops the rest of the output and
//! the command goes on, so a tour still removes its machine and a call still exits with
//! its own code. Any other write error is said once on stderr.

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static GONE: AtomicBool = AtomicBool::new(false);

/// One line (or text without its newline when `newline` is false) to stdout.
pub fn write(args: Arguments, newline: bool) {
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    let r = o.write_fmt(args).and_then(|_| if newline { o.write_all(b"\n") } else { Ok(()) }).and_then(|_| o.flush());
    if let Err(e) = r {
        GONE.store(true, Ordering::Relaxed);
        if e.kind() != ErrorKind::BrokenPipe {
            eprintln!("boxd-host: cannot write to stdout: {e}");
        }
    }
}

/// `println!` without the panic on a closed stdout.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write(format_args!(""), true) };
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), true) };
}

/// `print!` without the panic on a closed stdout.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*), false) };
}

/// A tool's answer as text: pretty JSON with its one next step at the head, then the short
/// fields, the longest last (the OpenCode bridge's lib/answer.js does the same). A client
/// that cuts a long output keeps its head (OpenCode keeps 2000 lines or 50 KB of a tool's):
/// a harvest of hundreds of files lost its next step, proof and git state, which came after
/// its "files" list in the component's alphabetical order.
pub fn answer_text(v: &serde_json::Value) -> String {
    const HEAD: [&str; 3] = ["error", "message", "next"];
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    let Some(map) = v.as_object().filter(|m| !m.is_empty()) else { return pretty(v) };
    let mut rest: Vec<(&String, usize)> = map.iter().filter(|(k, _)| !HEAD.contains(&k.as_str())).map(|(k, v)| (k, v.to_string().len())).collect();
    // Stable: keys of one length keep their (alphabetical) order.
    rest.sort_by_key(|(_, len)| *len);
    let head = HEAD.iter().filter_map(|h| map.get_key_value(*h)).map(|(k, _)| k);
    let mut out = String::from("{");
    for (i, k) in head.chain(rest.into_iter().map(|(k, _)| k)).enumerate() {
        out.push_str(if i == 0 { "\n  " } else { ",\n  " });
        out.push_str(&serde_json::Value::String(k.clone()).to_string());
        out.push_str(": ");
        // A string never holds a raw newline in JSON: every newline here is the layout's.
        out.push_str(&pretty(&map[k]).replace('\n', "\n  "));
    }
    out.push_str("\n}");
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn an_answer_leads_with_its_next_step_and_keeps_the_longest_field_last() {
        let files: Vec<_> = (0..400).map(|i| json!({ "path": format!("src/f{i}.txt"), "sha256": "ab".repeat(32) })).collect();
        let v = json!({ "files": files, "git": { "head": "abc" }, "next": "The transcript is proven.", "proven": true, "work": "w1" });
        let text = super::answer_text(&v);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), v, "the same answer");
        let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap();
        assert!(at("next") < at("proven") && at("proven") < at("work") && at("git") < at("files"), "{}", &text[..300]);
        assert!(text.lines().take(20).any(|l| l.contains("\"git\"")), "{}", &text[..300]);
        let e = super::answer_text(&json!({ "next": "n", "error": "E", "message": "m" }));
        assert_eq!(e, "{\n  \"error\": \"E\",\n  \"message\": \"m\",\n  \"next\": \"n\"\n}");
        assert_eq!(super::answer_text(&json!({})), "{}");
        assert_eq!(super::answer_text(&json!({ "a": { "b": [1, 2] } })), serde_json::to_string_pretty(&json!({ "a": { "b": [1, 2] } })).unwrap());
    }
}
