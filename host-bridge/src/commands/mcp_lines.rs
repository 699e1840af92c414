//! Every request line gets an answer. rmcp drops a line it cannot read without a word
//! (not JSON, not UTF-8, a lone UTF-16 surrogate, `params` or `_meta` not an object, a line
//! over its 16 MiB), so a client waited for ever; a tools/call whose `arguments` is not an
//! object, or whose `name` is not a string, was -32601 where docs/hosts.md promises the
//! tools' own error; and two calls in flight under one id both ran, one answered.
//!
//! `Lines` sits between stdin and rmcp and looks at each line first. A line rmcp would
//! drop, whose `id` can still be read, is handed on rewritten as a call of the `REFUSE`
//! tool carrying the JSON-RPC error (-32700 not JSON or not UTF-8, -32602 bad params,
//! -32600 an id already in flight), which `Server::call_tool` answers with that error: the
//! answer goes out through rmcp like any other, so nothing else writes stdout. A
//! tools/call over the size gets the tool error FILE_TOO_LARGE. Arguments that are not an
//! object are wrapped (`RAW_ARGUMENTS`) and reach the component as they came (ARGS_INVALID,
//! as from `boxd-host call`); a name that is not a string reaches it as text
//! (TOOL_UNKNOWN). A line without a readable id is dropped and said on stderr: there is
//! no request to answer. `Sent` watches the answers going out, to know which ids are in
//! flight; a second call under an id in flight is refused (-32600) once the first is
//! answered (`InFlight` says why not at once).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The tool a refused line becomes: its arguments are `{code, message}` (a JSON-RPC
/// error) or `{toolError}` (a tool result). No tool can be named so (a NUL byte).
pub const REFUSE: &str = "\0boxd-host:refuse";
/// The key that carries `arguments` that were not an object, as they came.
pub const RAW_ARGUMENTS: &str = "\0boxd-host:arguments";

/// The longest line handed on: rmcp's own limit, less room for a rewrite.
const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH - 4096;
/// How much of a line over the limit is kept to find its id and method.
const HEAD: usize = 64 * 1024;

/// The ids of the requests in flight (as JSON text), with how many of each, and the
/// refusals of second requests under an id in flight, held until the first is answered.
/// rmcp keeps one entry per id: a second request under the same id replaces the first's,
/// and the first's answer is then dropped, so the refusal may reach rmcp only after it.
#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<Shared>>);

#[derive(Default)]
struct Shared {
    ids: HashMap<String, u32>,
    held: Vec<(String, Vec<u8>)>,
    /// Refusals let go, for `Lines` to hand on.
    released: Vec<u8>,
    /// The reader waiting for input, woken when a refusal is let go.
    waker: Option<std::task::Waker>,
}

impl InFlight {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn change(&self, id: &Value, by: i32) -> u32 {
        let mut shared = self.shared();
        let n = shared.ids.entry(id.to_string()).or_default();
        *n = n.saturating_add_signed(by);
        let now = *n;
        if now == 0 {
            shared.ids.remove(&id.to_string());
        }
        now
    }

    /// The request under `id` was answered (or given up): let one refusal held for it go.
    fn done(&self, id: &Value) {
        self.change(id, -1);
        let mut shared = self.shared();
        let key = id.to_string();
        if let Some(at) = shared.held.iter().position(|(k, _)| *k == key) {
            let (_, line) = shared.held.remove(at);
            shared.released.extend_from_slice(&line);
            shared.released.push(b'\n');
            if let Some(w) = shared.waker.take() {
                w.wake();
            }
        }
    }
}

/// stdin as rmcp reads it: line by line, each looked at first (the module says how).
pub struct Lines<R> {
    inner: R,
    in_flight: InFlight,
    /// The line being read; past MAX_LINE only its head is kept.
    line: Vec<u8>,
    over: usize,
    /// Lines ready for rmcp.
    ready: Vec<u8>,
    at: usize,
    ended: bool,
}

impl<R> Lines<R> {
    pub fn new(inner: R, in_flight: InFlight) -> Self {
        Lines { inner, in_flight, line: Vec::new(), over: 0, ready: Vec::new(), at: 0, ended: false }
    }

    fn take(&mut self, bytes: &[u8]) {
        for part in bytes.split_inclusive(|&b| b == b'\n') {
            let (body, complete) = match part.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (part, false),
            };
            if self.over > 0 || self.line.len() + body.len() > MAX_LINE {
                // The bytes kept before the line went over count too (the size said was
                // only what came after them).
                if self.over == 0 {
                    self.over = self.line.len();
                }
                let room = HEAD.saturating_sub(self.line.len());
                self.line.extend_from_slice(&body[..body.len().min(room)]);
                self.over += body.len();
            } else {
                self.line.extend_from_slice(body);
            }
            if complete {
                self.finish_line();
            }
        }
    }

    fn finish_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let over = std::mem::take(&mut self.over);
        let handed = if over > 0 { too_long(&line, over) } else { look(&line, &self.in_flight) };
        if let Some(bytes) = handed {
            self.ready.extend_from_slice(&bytes);
            self.ready.push(b'\n');
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Lines<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let released = std::mem::take(&mut self.in_flight.shared().released);
            self.ready.extend_from_slice(&released);
            if self.at < self.ready.len() {
                let n = buf.remaining().min(self.ready.len() - self.at);
                let at = self.at;
                buf.put_slice(&self.ready[at..at + n]);
                self.at += n;
                if self.at == self.ready.len() {
                    self.ready.clear();
                    self.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 64 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut self.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of input: a last line without its newline is still a line.
                    if !self.line.is_empty() || self.over > 0 {
                        self.finish_line();
                    }
                    self.ended = true;
                }
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().to_vec();
                    self.take(&filled);
                }
                Poll::Pending => {
                    let mut shared = self.in_flight.shared();
                    if shared.released.is_empty() {
                        shared.waker = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                }
                other => return other,
            }
        }
    }
}

/// A request rmcp would drop or misanswer, as a call of REFUSE with the error.
fn refusal(id: &Value, code: i32, message: String) -> Vec<u8> {
    call_of_refuse(id, json!({ "code": code, "message": message }))
}

fn call_of_refuse(id: &Value, arguments: Value) -> Vec<u8> {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": REFUSE, "arguments": arguments } }).to_string().into_bytes()
}

/// A line past MAX_LINE (only its head kept): a tools/call is FILE_TOO_LARGE, any other
/// request -32600; without a readable id it is dropped.
fn too_long(head: &[u8], len: usize) -> Option<Vec<u8>> {
    let (id, method) = top_level(head);
    let what = format!("the message is {len} bytes or more; one MCP message may hold at most {MAX_LINE} bytes here ({} MiB less 4 KiB)", (MAX_LINE + 4096) >> 20);
    let Some(id) = id else {
        eprintln!("boxd-host: mcp: dropped a line without a readable id: {what}");
        return None;
    };
    if method.as_deref() == Some("tools/call") {
        let error = json!({
            "error": "FILE_TOO_LARGE",
            "message": format!("{what}; a prompt may be 4 MiB"),
            "next": "Put the bulk of the text in a file and send it with files, then refer to it in a short prompt.",
        });
        return Some(call_of_refuse(&id, json!({ "toolError": error })));
    }
    Some(refusal(&id, -32600, what))
}

/// One line as rmcp should get it (the module says how), or none.
fn look(line: &[u8], in_flight: &InFlight) -> Option<Vec<u8>> {
    let mut v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            let (code, why) = if std::str::from_utf8(line).is_err() {
                (-32700, "the message is not UTF-8, as JSON must be".to_string())
            } else if serde_json::from_slice::<Value>(&without_surrogates(line)).is_ok() {
                (-32602, format!("a string holds a lone UTF-16 surrogate, which is not Unicode ({e})"))
            } else {
                (-32700, format!("the message is not JSON ({e})"))
            };
            return match top_level(line).0 {
                Some(id) => Some(refusal(&id, code, why)),
                None if line.iter().all(u8::is_ascii_whitespace) => Some(line.to_vec()),
                None => {
                    eprintln!("boxd-host: mcp: dropped a line without a readable id: {why}");
                    None
                }
            };
        }
    };
    let Some(msg) = v.as_object_mut() else { return Some(line.to_vec()) };
    // The client gives an id up when it cancels the request (its answer is dropped).
    if msg.get("method").and_then(Value::as_str) == Some("notifications/cancelled") {
        if let Some(id) = msg.get("params").and_then(|p| p.get("requestId")) {
            in_flight.done(id);
        }
        return Some(line.to_vec());
    }
    if msg.get("method").and_then(Value::as_str) != Some("tools/call") {
        return Some(line.to_vec());
    }
    let Some(id) = msg.get("id").cloned() else { return Some(line.to_vec()) };
    let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) else {
        return Some(refusal(&id, -32602, "tools/call: params must be an object with the tool's name and arguments".into()));
    };
    if params.get("_meta").is_some_and(|m| !m.is_object()) {
        return Some(refusal(&id, -32602, "tools/call: params._meta must be an object".into()));
    }
    let mut rewritten = false;
    match params.get("name") {
        Some(Value::String(_)) => {}
        None | Some(Value::Null) => {
            params.insert("name".into(), json!(""));
            rewritten = true;
        }
        Some(other) => {
            let text = other.to_string();
            params.insert("name".into(), json!(text));
            rewritten = true;
        }
    }
    match params.get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(other) => {
            let raw = json!({ RAW_ARGUMENTS: other });
            params.insert("arguments".into(), raw);
            rewritten = true;
        }
    }
    if in_flight.change(&id, 1) > 1 {
        // Counted too (its own answer takes it off again), and held until the first is
        // answered (InFlight says why).
        let refused = refusal(&id, -32600, format!("a request with id {id} was already in flight; give each request its own id"));
        in_flight.shared().held.push((id.to_string(), refused));
        return None;
    }
    Some(if rewritten { v.to_string().into_bytes() } else { line.to_vec() })
}

/// `line` with each `\uD800`…`\uDFFF` escape (a UTF-16 surrogate, paired or not) made
/// `\uFFFD`: if that parses, the line's only fault was a lone surrogate.
fn without_surrogates(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] == b'\\' && i + 1 < line.len() {
            let hex = line.get(i + 2..i + 6).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u16::from_str_radix(h, 16).ok());
            if line[i + 1] == b'u' && hex.is_some_and(|h| (0xD800..=0xDFFF).contains(&h)) {
                out.extend_from_slice(b"\\ufffd");
                i += 6;
            } else {
                out.extend_from_slice(&line[i..i + 2]);
                i += 2;
            }
            continue;
        }
        out.push(line[i]);
        i += 1;
    }
    out
}

/// stdout as rmcp writes it: each answer going out takes its id off `InFlight`.
pub struct Sent<W> {
    inner: W,
    in_flight: InFlight,
    /// The head of the line being written (the id comes first in rmcp's answers).
    head: Vec<u8>,
}

impl<W> Sent<W> {
    pub fn new(inner: W, in_flight: InFlight) -> Self {
        Sent { inner, in_flight, head: Vec::new() }
    }

    fn saw(&mut self, bytes: &[u8]) {
        for part in bytes.split_inclusive(|&b| b == b'\n') {
            let room = 4096usize.saturating_sub(self.head.len());
            self.head.extend_from_slice(&part[..part.len().min(room)]);
            if part.ends_with(b"\n") {
                if let (Some(id), None) = top_level(&self.head) {
                    self.in_flight.done(&id);
                }
                self.head.clear();
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Sent<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            let n = *n;
            self.saw(&buf[..n]);
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The top-level `id` and `method` of a JSON object read as far as it goes: a line cut
/// short, not UTF-8, or with a string serde_json refuses still gives them when they come
/// before the damage.
pub fn top_level(line: &[u8]) -> (Option<Value>, Option<String>) {
    let mut s = Scan { b: line, i: 0 };
    let (mut id, mut method) = (None, None);
    s.ws();
    if !s.eat(b'{') {
        return (None, None);
    }
    loop {
        s.ws();
        let Some(key) = s.string() else { break };
        s.ws();
        if !s.eat(b':') {
            break;
        }
        s.ws();
        let start = s.i;
        if !s.value() {
            break;
        }
        let raw = &line[start..s.i];
        match key.as_slice() {
            b"id" => id = serde_json::from_slice::<Value>(raw).ok().filter(|v| v.is_string() || v.is_number()),
            b"method" => method = serde_json::from_slice::<String>(raw).ok(),
            _ => {}
        }
        s.ws();
        if !s.eat(b',') {
            break;
        }
    }
    (id, method)
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        let ok = self.b.get(self.i) == Some(&c);
        self.i += ok as usize;
        ok
    }
    /// A string's raw bytes (escapes left as they are), or none if it does not end.
    fn string(&mut self) -> Option<Vec<u8>> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        while let Some(&c) = self.b.get(self.i) {
            self.i += 1;
            match c {
                b'\\' => self.i += 1,
                b'"' => return Some(self.b[start..self.i - 1].to_vec()),
                _ => {}
            }
        }
        None
    }
    /// Skip one value; false if it does not end.
    fn value(&mut self) -> bool {
        match self.b.get(self.i) {
            Some(b'"') => self.string().is_some(),
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                while let Some(&c) = self.b.get(self.i) {
                    match c {
                        b'"' => {
                            if self.string().is_none() {
                                return false;
                            }
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return true;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                false
            }
            Some(_) => {
                let start = self.i;
                while self.b.get(self.i).is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace()) {
                    self.i += 1;
                }
                self.i > start && self.i < self.b.len()
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_and_method_come_out_of_damaged_lines() {
        let cases: [(&[u8], Option<Value>, Option<&str>); 5] = [
            (br#"{"jsonrpc":"2.0","id":35,"method":"tools/call","params":{"name":"boxd_job""#, Some(json!(35)), Some("tools/call")),
            (b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"tools/call\",\"params\":{\"arguments\":{\"work\":\"w\xff1\"}}}", Some(json!("a")), Some("tools/call")),
            (br#"{"params":{"id":9,"x":"\ud800"},"id":31,"method":"m"}"#, Some(json!(31)), Some("m")),
            (br#"{"id":null}"#, None, None),
            (b"this is not json", None, None),
        ];
        for (line, id, method) in cases {
            assert_eq!(top_level(line), (id, method.map(str::to_string)), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn bad_calls_become_refusals_or_reach_the_component_as_they_came() {
        let in_flight = InFlight::default();
        let out = |line: &str| serde_json::from_slice::<Value>(&look(line.as_bytes(), &in_flight).unwrap()).unwrap();
        let v = out(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#);
        assert_eq!((v["id"].clone(), v["params"]["name"].clone(), v["params"]["arguments"]["code"].clone()), (json!(1), json!(REFUSE), json!(-32602)));
        let v = out(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"boxd_job","arguments":[1]}}"#);
        assert_eq!(v["params"]["arguments"], json!({ RAW_ARGUMENTS: [1] }));
        let v = out(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":5}}"#);
        assert_eq!(v["params"]["name"], "5");
        let second = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"boxd_job"}}"#;
        assert!(look(second, &in_flight).is_none(), "a second call under id 3 while the first is in flight is held");
        in_flight.done(&json!(3));
        let released = std::mem::take(&mut in_flight.shared().released);
        let v: Value = serde_json::from_slice(&released).unwrap();
        assert_eq!(v["params"]["arguments"]["code"], -32600, "{v}");
        let v = out(r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#);
        assert_eq!(v["method"], "tools/list");
    }

    /// A call past the cap, read in chunks, is refused naming its whole size (it named only
    /// what came after the line went over: a 20 MiB line read as 4 MB, under the cap).
    #[test]
    fn a_line_past_the_cap_is_refused_naming_its_whole_size() {
        let mut lines = Lines::new((), InFlight::default());
        let head = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"boxd_job","arguments":{"x":""#;
        let total = MAX_LINE + 5000;
        lines.take(head);
        let chunk = vec![b'a'; 1 << 20];
        let mut sent = head.len();
        while sent < total {
            let n = (total - sent).min(chunk.len());
            lines.take(&chunk[..n]);
            sent += n;
        }
        lines.take(b"\n");
        let v: Value = serde_json::from_slice(lines.ready.strip_suffix(b"\n").unwrap()).unwrap();
        assert!(v.to_string().contains(&format!("the message is {total} bytes or more")), "{v}");
    }
}
