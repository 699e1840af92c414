//! The guest's transcript made fit to import into the laptop's OpenCode. The guest is
//! untrusted: its agent can edit its own OpenCode data and rewrite the helper's answers.
//! So a session's `info` is rebuilt from the few fields OpenCode needs to list and continue
//! it (never a permission rule but one that denies, nor its agent, model, revert or
//! workspace, which change how the laptop's OpenCode acts), a user message loses what
//! would steer a laptop turn (`system`, `tools`, `format`), a patch part loses its file
//! list (a revert on the laptop deletes the listed files it cannot check out), and a file
//! part or a tool's attachment keeps no URL the laptop would fetch (only `data:`). Every
//! message and part must name the session and message it is in (the import files a part
//! under the message its `messageID` names), and no message, part or session may be one
//! the laptop already holds elsewhere: another work's proven transcript, this work's other
//! session, or a session of the user's own.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Exported;
use crate::errors::{Code, ToolError, ToolResult};
use crate::ledger::{Ledger, Work};
use crate::opencode::{Held, Opencode};
use crate::tools::Env;

/// What a session's `info` keeps: OpenCode's import requires `id`, `slug`, `title`,
/// `version` and `time` (it sets the project, directory and path itself); `parentID` links
/// a child; of its `permission` rules only those that deny. Everything else (rules that
/// allow or ask, `agent`, `model`, `revert`, `share`, `workspaceID`, `metadata`,
/// `summary`, cost and tokens) is left out.
const SESSION_KEYS: [&str; 5] = ["id", "slug", "parentID", "title", "version"];

/// What a user message keeps: its identity, time and the agent and model it ran with
/// (OpenCode requires both); not a `system` prompt, `tools` switches or an output `format`,
/// which a laptop turn taken from that message would use.
const USER_KEYS: [&str; 7] = ["id", "sessionID", "role", "time", "agent", "model", "summary"];

/// One exported session `{info, messages}` as it may be imported.
pub(super) fn clean_session(s: &Value) -> Value {
    let info = &s["info"];
    let mut out = Map::new();
    for k in SESSION_KEYS {
        if let Some(v) = info.get(k).filter(|v| v.is_string()) {
            out.insert(k.to_string(), v.clone());
        }
    }
    let mut time = Map::new();
    for k in ["created", "updated"] {
        if let Some(v) = info["time"].get(k).filter(|v| v.is_number()) {
            time.insert(k.to_string(), v.clone());
        }
    }
    out.insert("time".into(), Value::Object(time));
    // A rule that denies can only narrow what the laptop grants (OpenCode's task tool gives
    // a child session such rules): kept. One that allows or asks is the guest's to choose
    // for itself only.
    let denies: Vec<Value> = info["permission"].as_array().into_iter().flatten().filter(|r| is_deny(r)).map(|r| serde_json::json!({ "permission": r["permission"], "pattern": r["pattern"], "action": "deny" })).collect();
    if !denies.is_empty() {
        out.insert("permission".into(), Value::Array(denies));
    }
    let messages: Vec<Value> = s["messages"].as_array().into_iter().flatten().map(clean_message).collect();
    serde_json::json!({ "info": Value::Object(out), "messages": messages })
}

fn is_deny(rule: &Value) -> bool {
    rule["permission"].is_string() && rule["pattern"].is_string() && rule["action"] == "deny"
}

fn clean_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(info) = m["info"].as_object_mut().filter(|i| i.get("role").is_some_and(|r| r == "user")) {
        info.retain(|k, _| USER_KEYS.contains(&k.as_str()));
    }
    for p in m["parts"].as_array_mut().into_iter().flatten() {
        if p["type"] == "patch" {
            p["files"] = Value::Array(Vec::new());
        }
        if p["type"] == "file" && !carries_its_bytes(&p["url"]) {
            inert_file(p);
        }
        if let Some(attachments) = p.get_mut("state").and_then(|s| s.get_mut("attachments")).and_then(Value::as_array_mut) {
            attachments.retain(|a| carries_its_bytes(&a["url"]));
        }
    }
    m
}

/// Whether a file's URL carries its bytes (`data:`). Any other URL is one the laptop's
/// OpenCode would fetch when the session goes on there: a `file:` URL names a laptop path
/// (its provider refuses the scheme, and the session could never go on), an `http(s):` one
/// is fetched from the laptop at every turn.
fn carries_its_bytes(url: &Value) -> bool {
    url.as_str().is_some_and(|u| u.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("data:")))
}

/// A file part made inert: kept (its id is in the proof) as an empty plain-text file, which
/// OpenCode never sends to a model (a plain-text file's text went into the prompt when it
/// was attached).
fn inert_file(p: &mut Value) {
    p["mime"] = Value::String("text/plain".into());
    p["url"] = Value::String("data:text/plain;base64,".into());
}

/// Each message names this session, each part this session and its own message; no
/// message or part id is used twice in the export (`seen`).
pub(super) fn check_session(s: &Value, id: &str, seen: &mut BTreeSet<String>) -> Result<(), String> {
    for m in s["messages"].as_array().into_iter().flatten() {
        let mid = m["info"]["id"].as_str().unwrap_or_default();
        if m["info"]["sessionID"].as_str() != Some(id) {
            return Err(format!("message {mid} of session {id} names session {}", m["info"]["sessionID"]));
        }
        if !seen.insert(mid.to_string()) {
            return Err(format!("message {mid} appears twice"));
        }
        for p in m["parts"].as_array().into_iter().flatten() {
            let pid = p["id"].as_str().filter(|p| !p.is_empty()).ok_or_else(|| format!("a part of message {mid} has no id"))?;
            if p["messageID"].as_str() != Some(mid) || p["sessionID"].as_str() != Some(id) {
                return Err(format!("part {pid} of message {mid} in session {id} names message {} of session {}", p["messageID"], p["sessionID"]));
            }
            if !seen.insert(pid.to_string()) {
                return Err(format!("part {pid} appears twice"));
            }
        }
    }
    Ok(())
}

/// The refusal of a transcript that could only come from a changed guest.
fn tampered(w: &Work, why: String) -> ToolError {
    ToolError::with_next(
        Code::ExportInvalid,
        format!("the guest of work '{}' exported {why}; nothing was imported", w.work),
        format!("Look at the machine of work '{}' (its OpenCode data or the helper was changed) before you harvest or drop it; the laptop's transcripts are untouched.", w.work),
    )
}

/// The ids a stored export holds: its messages' and their parts'.
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    messages: Vec<StoredMessage>,
}

#[derive(Deserialize)]
struct StoredMessage {
    info: IdOnly,
    #[serde(default)]
    parts: Vec<IdOnly>,
}

#[derive(Deserialize)]
struct IdOnly {
    id: String,
}

/// No message or part about to be imported is one the ledger holds in another session's
/// proven export (another work's, or another session of this work's): the laptop's import
/// keeps the row it has and files the guest's parts under it, so that transcript would
/// grow (a fork's guest holds its parent's OpenCode data, every id in it). Read from the
/// exports each work's last proof stored, only when something is to be imported.
pub(super) fn refuse_foreign_ids(env: &mut Env, w: &Work, sessions: &[&Exported]) -> ToolResult<()> {
    if sessions.is_empty() {
        return Ok(());
    }
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for s in sessions {
        for m in s.json["messages"].as_array().into_iter().flatten() {
            wanted.extend(m["info"]["id"].as_str().map(|id| (id, s.id.as_str())));
            wanted.extend(m["parts"].as_array().into_iter().flatten().filter_map(|p| p["id"].as_str()).map(|id| (id, s.id.as_str())));
        }
    }
    let mut ledger = Ledger::for_call(&mut env.files, env.ctx);
    let mut stored: Vec<(String, String, String)> = Vec::new();
    for id in ledger.ids()? {
        let record = if id == w.work { Some(w.clone()) } else { ledger.read(&id).ok().flatten() };
        let Some(proof) = record.as_ref().and_then(|r| r.proofs.last()) else { continue };
        for p in &proof.sessions {
            stored.extend(p.file.as_ref().map(|f| (id.clone(), p.id.clone(), f.clone())));
        }
    }
    for (work, session, file) in stored {
        let Some(bytes) = ledger.get_blob(&work, &file)? else { continue };
        let Ok(held) = serde_json::from_slice::<Stored>(&bytes) else { continue };
        let ids = held.messages.iter().flat_map(|m| core::iter::once(&m.info.id).chain(m.parts.iter().map(|p| &p.id)));
        for id in ids {
            let Some(ours) = wanted.get(id.as_str()) else { continue };
            if work == w.work && *ours == session {
                continue;
            }
            let whose = if work == w.work { format!("this work's session {session}") } else { format!("work '{work}''s session {session}") };
            return Err(tampered(w, format!("{id} in session {ours}, which is {whose} on this laptop")));
        }
    }
    Ok(())
}

/// Sessions new to this work that the laptop's OpenCode already holds are not the guest's
/// to write into: `opencode import` would add the guest's messages to one of the user's own
/// sessions and move it into this work's folder. Each new id is looked up (`opencode
/// export`, side by side); one held with only messages of the guest's is this work's own
/// earlier import whose proof was never recorded, and is imported again.
pub(super) fn refuse_held_sessions(env: &mut Env, w: &Work, new: &[&Exported]) -> ToolResult<()> {
    if new.is_empty() {
        return Ok(());
    }
    // Another harvest of this work at once may have imported and proven one since this one
    // began: it is this work's own.
    let now = Ledger::for_call(&mut env.files, env.ctx).read(&w.work)?;
    let proven: BTreeSet<&str> = now.iter().flat_map(|w| w.proofs.last()).flat_map(|p| &p.sessions).map(|s| s.id.as_str()).collect();
    let new: Vec<&Exported> = new.iter().filter(|s| !proven.contains(s.id.as_str())).copied().collect();
    if new.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = new.iter().map(|s| s.id.as_str()).collect();
    let held = Opencode::new(&mut env.programs).held(&ids, &w.directory)?;
    for (s, h) in new.iter().zip(held) {
        let back = match h {
            Held::Absent => continue,
            Held::Unreadable(why) => return Err(tampered(w, format!("session {}, which this laptop's OpenCode already holds (its copy could not be read: {why})", s.id))),
            Held::Copy(back) => back,
        };
        let theirs = super::message_ids(&s.json);
        let others = back["messages"].as_array().into_iter().flatten().filter(|m| !m["info"]["id"].as_str().is_some_and(|id| theirs.contains(id))).count();
        if others > 0 {
            let place = back["info"]["directory"].as_str().unwrap_or("another folder");
            return Err(tampered(w, format!("session {}, which this laptop's OpenCode already holds in {place} with {others} messages not in the guest's export (a session no work of this ledger proved: the user's own)", s.id)));
        }
    }
    Ok(())
}
