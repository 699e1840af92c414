//! The guest side of a work, seen from the laptop: the helper script we upload, and the
//! one-exec-per-call protocol we speak with it (docs/guest.md). Every call is
//! `python3 <helper> <command> --work <id> …` through `boxd machine exec`, payloads on
//! stdin, one JSON object back.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::boxd::{first_json, Boxd, Failure};
use crate::caps::Programs;
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};

/// The guest helper, embedded so what we upload is exactly what we built.
pub const HELPER: &[u8] = include_bytes!("../guest/helper.py");

/// Where the helper lives on the guest, relative to its home: named by its sha256, so a
/// present file is the right file (the upload verifies the digest before the rename).
pub fn helper_path() -> String {
    format!(".boxd-helper/helper-{}.py", sha256_hex(HELPER))
}

/// The codes the guest helper reports (docs/guest.md); any other name is GUEST_FAILED.
pub const GUEST_CODES: &[Code] = &[
    Code::GuestFailed, Code::GuestWorkspace, Code::GuestVersion, Code::GuestRunFailed, Code::GuestAuthFailed,
    Code::GuestUnresponsive, Code::GuestServerDown, Code::SessionBusy, Code::RunInterrupted, Code::ExportInvalid,
    Code::NameInvalid, Code::PathRefused, Code::FileTooLarge, Code::ArgsInvalid, Code::WorkUnknown,
];

/// "exited with 5" / "was killed by a signal", for messages.
pub fn exit_words(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exited with {c}"),
        None => "was killed by a signal".to_string(),
    }
}

/// How long one helper call may take on the guest (prepare waits for the server).
pub const HELPER_TIMEOUT_S: u32 = 120;

pub struct Guest<'b, 'a, P: Programs> {
    pub boxd: &'b mut Boxd<'a, P>,
    pub machine: String,
    pub work: String,
}

impl<'b, 'a, P: Programs> Guest<'b, 'a, P> {
    pub fn new(boxd: &'b mut Boxd<'a, P>, machine: &str, work: &str) -> Self {
        Self { boxd, machine: machine.to_string(), work: work.to_string() }
    }

    /// Upload the helper and check its digest on the guest before it is put in place.
    pub fn upload(&mut self) -> ToolResult<()> {
        let sha = sha256_hex(HELPER);
        let script = format!(
            "mkdir -p .boxd-helper && cat > .boxd-helper/upload.tmp && \
             [ \"$(sha256sum .boxd-helper/upload.tmp | cut -d' ' -f1)\" = {sha} ] && \
             mv .boxd-helper/upload.tmp .boxd-helper/helper-{sha}.py"
        );
        let out = self.boxd.exec(&self.machine, &["sh", "-c", &script], Some(HELPER.to_vec()), 60).map_err(Failure::into_error)?;
        if out.exit_code == Some(0) {
            Ok(())
        } else {
            Err(ToolError::new(
                Code::GuestWorkspace,
                format!("could not place the guest helper in the machine's home: {}", tail(&out.stderr)),
            ))
        }
    }

    /// One helper command. The helper's digest is checked on the guest before every use
    /// (exit 86 when it is missing or changed), and then it is uploaded and the call retried.
    pub fn call(&mut self, command: &str, flags: &[&str], stdin: Option<Vec<u8>>) -> ToolResult<Value> {
        let helper = helper_path();
        let mut line = alloc::vec![String::from("python3"), helper.clone(), command.to_string(), "--work".into(), self.work.clone()];
        line.extend(flags.iter().map(|f| f.to_string()));
        let line: Vec<String> = line.iter().map(|w| crate::boxd::sh_quote(w)).collect();
        let script = format!(
            "[ \"$(sha256sum {helper} 2>/dev/null | cut -c1-64)\" = {sha} ] || exit 86; exec {}",
            line.join(" "),
            sha = sha256_hex(HELPER),
        );
        let words = ["sh", "-c", script.as_str()];
        let mut out = self.boxd.exec(&self.machine, &words, stdin.clone(), HELPER_TIMEOUT_S).map_err(Failure::into_error)?;
        if out.exit_code == Some(86) {
            self.upload()?;
            out = self.boxd.exec(&self.machine, &words, stdin, HELPER_TIMEOUT_S).map_err(Failure::into_error)?;
        }
        match out.exit_code {
            Some(0) => first_json(&out.stdout).ok_or_else(|| {
                let code = if command == "export" { Code::ExportInvalid } else { Code::GuestFailed };
                ToolError::new(code, format!("the guest helper's {command} printed no JSON: {}", tail(&out.stderr)))
            }),
            Some(3) => {
                let v = first_json(&out.stdout).unwrap_or(Value::Null);
                let kind = v.get("error").and_then(Value::as_str).unwrap_or("GUEST_FAILED");
                let message = v.get("message").and_then(Value::as_str).unwrap_or("the guest helper failed").to_string();
                // Only the codes the helper speaks: a guest cannot claim a laptop's code
                // (HOST_FAILED, ACCESS_DENIED, …) and its next step.
                let code = Code::parse(kind).filter(|c| GUEST_CODES.contains(c)).unwrap_or(Code::GuestFailed);
                Err(ToolError::new(code, format!("{}: {message}", self.machine)))
            }
            Some(86) => Err(ToolError::new(Code::GuestFailed, format!("{}: the guest helper does not match its digest even after a fresh upload", self.machine))),
            Some(127) => Err(ToolError::new(Code::GuestFailed, format!("{} has no python3, which the guest helper needs", self.machine))),
            other => Err(ToolError::new(
                Code::GuestFailed,
                format!("the guest helper's {command} {}: {}", exit_words(other), tail(&out.stderr)),
            )),
        }
    }

    /// A helper command that also asks about the prompts the laptop never heard back on
    /// (`--resolve`); returns the answer and the guest's word on them (id → admitted).
    pub fn call_resolving(&mut self, command: &str, unresolved: &[String]) -> ToolResult<(Value, BTreeMap<String, bool>)> {
        let ids = unresolved.join(",");
        let flags: &[&str] = if ids.is_empty() { &[] } else { &["--resolve", ids.as_str()] };
        let answer = self.call(command, flags, None)?;
        let known = resolved(&answer);
        Ok((answer, known))
    }
}

/// The guest's word on the prompt ids a call asked about: id → admitted.
pub fn resolved(answer: &Value) -> BTreeMap<String, bool> {
    answer
        .get("resolved")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_bool().map(|b| (k.clone(), b))).collect())
        .unwrap_or_default()
}

/// The last line or two of a stream, for messages.
pub fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(2);
    let s = lines[start..].join(" | ");
    if s.len() > 400 { format!("{}…", &s[..s.char_indices().nth(400).map_or(s.len(), |(i, _)| i)]) } else { s }
}
