//! Masking secrets in text that leaves the guest (the newest assistant text): API keys,
//! tokens, bearer credentials and long opaque strings, before it reaches a model or a log.

use alloc::string::String;

const PREFIXES: &[&str] = &["sk-", "sk_", "ghp_", "gho_", "ghs_", "github_pat_", "bxd_", "bxds_", "xoxb-", "xoxp-", "AKIA", "AIza", "glpat-"];

fn opaque(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    // The value of `name=value`; a pure hex run is a digest or a commit, not a credential.
    let w = w.rsplit(['=', ':']).next().unwrap_or(w);
    if w.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    if PREFIXES.iter().any(|p| w.starts_with(p) && w.len() >= p.len() + 8) {
        return true;
    }
    // A long run with letters and digits mixed (a token, a hash-like secret).
    w.len() >= 32
        && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_+/=".contains(&b))
        && w.bytes().any(|b| b.is_ascii_digit())
        && w.bytes().any(|b| b.is_ascii_alphabetic())
}

/// Mask secrets, then cut to at most `max` characters (with an ellipsis when cut).
pub fn redact(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut mask_next = false;
    for (i, piece) in text.split_inclusive(char::is_whitespace).enumerate() {
        let _ = i;
        let word = piece.trim_end();
        let tail = &piece[word.len()..];
        let lower = word.to_ascii_lowercase();
        let keyed = ["password=", "token=", "secret=", "api_key=", "apikey="].iter().find(|k| lower.contains(*k));
        if mask_next {
            out.push_str("[redacted]");
            mask_next = false;
        } else if let Some(k) = keyed {
            let at = lower.find(k).unwrap_or(0) + k.len();
            out.push_str(&word[..at]);
            out.push_str("[redacted]");
        } else if opaque(word) {
            out.push_str("[redacted]");
        } else {
            out.push_str(word);
        }
        if lower == "bearer" || lower == "authorization:" {
            mask_next = true;
        }
        out.push_str(tail);
    }
    cut(&out, max)
}

/// `text` cut to at most `max` characters, the last an ellipsis when cut: the one rule for
/// every text of unknown length that becomes part of an answer (a CLI's line, a log's tail).
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.into(),
        Some(_) => {
            let keep = text.char_indices().nth(max.saturating_sub(1)).map_or(text.len(), |(i, _)| i);
            let mut out = String::with_capacity(keep + 3);
            out.push_str(&text[..keep]);
            out.push('…');
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_tokens_and_keeps_prose() {
        let t = redact("Done. Used key sk-abcdefghijklmnop1234 and Bearer abc.def and token=hunter2 ok", 300);
        assert_eq!(t, "Done. Used key [redacted] and Bearer [redacted] and token=[redacted] ok");
        assert_eq!(redact("plain words stay", 300), "plain words stay");
        let digest = "sha256=0e23942e6f114eb11d7a6cbc5c8d5db9919883f76bba5a0c8d2ad72270b2e19a";
        assert_eq!(redact(digest, 300), digest, "digests and commits are not secrets");
        assert_eq!(redact("key=AbCdEfGh1234567890AbCdEfGh1234567890", 300), "[redacted]");
    }

    #[test]
    fn cuts_to_the_limit() {
        let t = redact(&"é".repeat(500), 300);
        assert_eq!(t.chars().count(), 300);
        assert!(t.ends_with('…'));
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "ab…");
        assert_eq!(cut("ééé", 2), "é…");
    }
}
