//! The guest side of a work, seen from the laptop: the helper zipapp we upload, and the
//! one-exec-per-call protocol we speak with it (docs/guest.md). Every call is
//! `python3 <helper> <command> --work <id> …` through `boxd machine exec`, payloads on
//! stdin, one JSON object back.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;

use crate::boxd::{first_json, Boxd, Failure, State};
use crate::caps::{Programs, Streamed, Streams};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};

/// The guest helper, embedded so what we upload is exactly what we built: one zipapp that
/// build.rs makes from component/guest (the `boxd_helper` package and protocol.json).
pub const HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/helper.pyz"));

/// Where the helper lives on the guest, relative to its home: named by its sha256, so a
/// present file is the right file (the upload verifies the digest before the rename).
pub fn helper_path() -> String {
    format!(".boxd-helper/helper-{}.pyz", sha256_hex(HELPER))
}

/// The error kinds the guest helper reports: exactly the `errorKinds` of
/// component/guest/protocol.json (a unit test keeps the two equal).
pub const GUEST_CODES: &[Code] = &[
    Code::ArgsInvalid, Code::ExportInvalid, Code::FileConflict, Code::FileTooLarge, Code::GuestFailed, Code::GuestServerDown,
    Code::GuestStateLost, Code::GuestUnresponsive, Code::GuestVersion, Code::GuestWorkspace, Code::NameInvalid, Code::NotOurs, Code::PathRefused,
    Code::RunInterrupted, Code::SessionBusy, Code::WorkUnknown,
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

/// A boxd call on a work's machine that failed or timed out: when the machine is asleep
/// now (another call's boxd_sleep, or its idle bound, put it to sleep under the call),
/// MACHINE_ASLEEP with boxd's words, so the next step is boxd_resume and not boxd's own
/// wake, which the ledger would not see. One `get`, asked only after such a failure.
pub fn failed_on<P: Programs>(boxd: &mut Boxd<P>, machine: &str, work: &str, f: Failure) -> ToolError {
    if !matches!(f, Failure::Other(_) | Failure::Timeout(_)) {
        return f.into_error();
    }
    let asleep = match boxd.get(machine) {
        Ok(Some(info)) => State::from_status(&info.status).filter(|s| matches!(s, State::Asleep | State::Stopped)),
        _ => None,
    };
    let e = f.into_error();
    match asleep {
        Some(s) => ToolError::with_next(
            Code::MachineAsleep,
            format!("{machine} is {} now: boxd answered this call's command on it with {} ({}), so it may not have run to its end", crate::tools::status::job_state(s), e.code.as_str(), e.message),
            format!("Call boxd_resume for work '{work}', then call again."),
        ),
        None => e,
    }
}

pub struct Guest<'b, 'a, P: Programs> {
    pub boxd: &'b mut Boxd<'a, P>,
    pub machine: String,
    pub work: String,
    /// The helper's last refusal (exit 3), as it printed it: its fields beyond the code and
    /// the message (a submit's `"admitted": false`).
    pub refused: Option<Value>,
}

impl<'b, 'a, P: Programs> Guest<'b, 'a, P> {
    pub fn new(boxd: &'b mut Boxd<'a, P>, machine: &str, work: &str) -> Self {
        Self { boxd, machine: machine.to_string(), work: work.to_string(), refused: None }
    }

    /// Upload the helper and check its digest on the guest before it is put in place. Each
    /// upload writes its own temp file (the guest shell's pid in its name): calls that find
    /// the helper missing at once (after a plugin update) each upload, and one rename wins.
    pub fn upload(&mut self) -> ToolResult<()> {
        let sha = sha256_hex(HELPER);
        let script = format!(
            "mkdir -p .boxd-helper && t=.boxd-helper/upload.tmp.$$ && cat > \"$t\" && \
             [ \"$(sha256sum \"$t\" | cut -d' ' -f1)\" = {sha} ] && \
             mv \"$t\" .boxd-helper/helper-{sha}.pyz || {{ rm -f \"$t\"; exit 1; }}"
        );
        let out = self.boxd.exec(&self.machine, &["sh", "-c", &script], Some(HELPER.to_vec()), 60).map_err(Failure::into_error)?;
        if out.exit_code == Some(0) {
            Ok(())
        } else {
            Err(ToolError::with_next(
                Code::GuestWorkspace,
                format!("could not place the guest helper in {}'s home: {}", self.machine, tail(&out.stderr)),
                format!(
                    "Look at ~/.boxd-helper on {m} (it must be a folder the boxd user can write; the message says what failed), fix it with 'boxd machine exec {m} -- …', then call again.",
                    m = self.machine
                ),
            ))
        }
    }

    /// A helper exec boxd failed or timed out (see `failed_on`).
    fn exec_failed(&mut self, f: Failure) -> ToolError {
        failed_on(self.boxd, &self.machine, &self.work, f)
    }

    /// One helper command. The helper's digest is checked on the guest before every use
    /// (exit 86 when it is missing or changed), and then it is uploaded and the call retried.
    pub fn call(&mut self, command: &str, flags: &[&str], stdin: Option<Vec<u8>>) -> ToolResult<Value> {
        self.call_streaming(command, flags, stdin, &Streams::default()).map(|(v, _)| v)
    }

    /// As `call`, with files streamed in and out by the host (docs/guest.md, "Frames");
    /// also returns what the host streamed.
    pub fn call_streaming(&mut self, command: &str, flags: &[&str], stdin: Option<Vec<u8>>, streams: &Streams) -> ToolResult<(Value, Vec<Streamed>)> {
        self.refused = None;
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
        let first = self.boxd.exec_streaming(&self.machine, &words, stdin.clone(), streams, HELPER_TIMEOUT_S);
        let mut out = first.map_err(|f| self.exec_failed(f))?;
        if out.exit_code == Some(86) {
            self.upload()?;
            let again = self.boxd.exec_streaming(&self.machine, &words, stdin, streams, HELPER_TIMEOUT_S);
            out = again.map_err(|f| self.exec_failed(f))?;
        }
        let streamed = core::mem::take(&mut out.files);
        match out.exit_code {
            Some(0) => first_json(&out.stdout).map(|v| (v, streamed)).ok_or_else(|| {
                let code = if command == "export" { Code::ExportInvalid } else { Code::GuestFailed };
                ToolError::new(code, format!("the guest helper's {command} printed no JSON: {}", tail(&out.stderr)))
            }),
            Some(3) => {
                self.refused = first_json(&out.stdout);
                let (kind, message) = reply(&out.stdout);
                let message = message.unwrap_or_else(|| "the guest helper failed".to_string());
                // Only the kinds the helper speaks: a guest cannot claim a laptop's code
                // (HOST_FAILED, ACCESS_DENIED, …) and its next step.
                match Code::parse(&kind).filter(|c| GUEST_CODES.contains(c)) {
                    Some(code) => Err(ToolError::new(code, format!("{}: {message}", self.machine))),
                    None => Err(ToolError::new(
                        Code::GuestFailed,
                        format!("{}: {message} (the guest helper reported '{kind}', which is not one of its error kinds)", self.machine),
                    )),
                }
            }
            // A command line the helper refused is a laptop/helper mismatch, not the
            // caller's arguments: its message is on stdout like every other answer.
            Some(2) => {
                let message = reply(&out.stdout).1.unwrap_or_else(|| tail(&out.stderr));
                Err(ToolError::new(Code::GuestFailed, format!("the guest helper refused the command line of {command}: {message}")))
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

/// The error kind and message of a failed helper's one JSON answer (GUEST_FAILED when it
/// names none).
fn reply(stdout: &[u8]) -> (String, Option<String>) {
    let v = first_json(stdout).unwrap_or(Value::Null);
    let kind = v.get("error").and_then(Value::as_str).unwrap_or("GUEST_FAILED").to_string();
    (kind, v.get("message").and_then(Value::as_str).map(str::to_string))
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
    crate::redact::cut(&lines[start..].join(" | "), 400)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Scripted;
    use serde_json::json;

    /// The one protocol file the helper reads from inside its zipapp.
    const PROTOCOL: &str = include_str!("../guest/protocol.json");

    fn protocol() -> Value {
        serde_json::from_str(PROTOCOL).expect("component/guest/protocol.json is JSON")
    }

    fn limit(name: &str, unit: &str) -> u64 {
        let l = &protocol()["limits"][name];
        assert_eq!(l["unit"], unit, "protocol.json limits.{name}.unit");
        l["max"].as_u64().unwrap_or_else(|| panic!("protocol.json limits.{name}.max"))
    }

    #[test]
    fn the_protocol_file_states_the_components_limits() {
        use crate::tools::{job, submit};
        assert_eq!(limit("prompt", "bytes"), submit::PROMPT_CAP as u64);
        assert_eq!(limit("file", "bytes"), submit::FILE_CAP);
        assert_eq!(limit("call", "bytes"), submit::CALL_CAP);
        assert_eq!(limit("lastText", "characters"), job::LAST_TEXT_MAX as u64);
        assert_eq!(protocol()["workId"]["maxLength"], crate::paths::WORK_ID_MAX);
    }

    #[test]
    fn every_error_kind_of_the_helper_is_a_guest_code() {
        let kinds: Vec<String> = protocol()["errorKinds"]
            .as_array()
            .expect("protocol.json errorKinds is a list")
            .iter()
            .map(|k| k.as_str().expect("an error kind is a string").to_string())
            .collect();
        let codes: Vec<String> = GUEST_CODES.iter().map(|c| c.as_str().to_string()).collect();
        assert_eq!(kinds, codes, "GUEST_CODES must list protocol.json's errorKinds, in order");
        for kind in &kinds {
            assert!(Code::parse(kind).is_some(), "{kind} is not a Code in errors.rs");
        }
    }

    #[test]
    fn the_embedded_helper_is_a_zipapp_with_the_protocol_file() {
        assert!(HELPER.starts_with(b"PK\x03\x04"), "helper.pyz is not a zip");
        // Entries are stored, so each file's bytes appear in the zipapp as they are.
        let holds = |bytes: &[u8]| HELPER.windows(bytes.len()).any(|w| w == bytes);
        assert!(holds(PROTOCOL.as_bytes()), "the zipapp does not carry protocol.json as it is");
        for name in ["__main__.py", "boxd_helper/cli.py", "boxd_helper/protocol.py", "protocol.json"] {
            assert!(holds(name.as_bytes()), "the zipapp has no {name}");
        }
        assert!(helper_path().ends_with(".pyz"));
    }

    fn failing(exit: i32, stdout: &str) -> ToolError {
        let mut p = Scripted::default();
        p.push_exit(exit, stdout, "");
        let mut b = Boxd::new(&mut p, 10);
        Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err()
    }

    #[test]
    fn a_usage_error_is_read_from_stdout_where_the_helper_prints_it() {
        let e = failing(2, &json!({ "ok": false, "error": "ARGS_INVALID", "message": "--work is required" }).to_string());
        assert_eq!(e.code, Code::GuestFailed);
        assert!(e.message.contains("--work is required"), "{}", e.message);
        assert!(e.message.contains("status"), "{}", e.message);
    }

    #[test]
    fn an_unknown_error_kind_is_guest_failed_and_named() {
        let e = failing(3, &json!({ "ok": false, "error": "HOST_FAILED", "message": "claimed" }).to_string());
        assert_eq!(e.code, Code::GuestFailed);
        assert!(e.message.contains("'HOST_FAILED'") && e.message.contains("claimed"), "{}", e.message);
        let e = failing(3, &json!({ "ok": false, "error": "SESSION_BUSY", "message": "a run" }).to_string());
        assert_eq!((e.code, e.message.as_str()), (Code::SessionBusy, "oc-w1: a run"));
    }

    #[test]
    fn an_exec_the_machine_fell_asleep_under_is_machine_asleep_and_any_other_failure_stays_boxds() {
        let asleep = "error: VM 'oc-w1' is hibernated — run 'boxd machine wake oc-w1' first";
        for (status, code) in [("hibernated", Code::MachineAsleep), ("running", Code::BoxdFailed)] {
            let mut p = Scripted::default();
            p.push_fail(1, asleep);
            p.push_exit(0, &json!({ "name": "oc-w1", "id": "vm_1", "status": status }).to_string(), "");
            let mut b = Boxd::new(&mut p, 10);
            let e = Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err();
            assert_eq!(e.code, code, "{e:?}");
            assert!(e.message.contains("is hibernated"), "boxd's own words stay in the message: {}", e.message);
            assert_eq!(p.commands().len(), 2, "the exec, then one get: {:?}", p.commands());
            if code == Code::MachineAsleep {
                assert!(e.next.contains("boxd_resume for work 'w1'"), "{}", e.next);
            }
        }
        // The helper's own failure is not boxd's: no get is spent on it.
        let mut p = Scripted::default();
        p.push_exit(5, "", "Traceback");
        let mut b = Boxd::new(&mut p, 10);
        assert_eq!(Guest::new(&mut b, "oc-w1", "w1").call("status", &[], None).unwrap_err().code, Code::GuestFailed);
        assert_eq!(p.commands().len(), 1);
    }
}
