//! The proof: the laptop's own copy of a session, read back after the import, holds the
//! guest's messages. Compared by a digest of what both copies keep (ids, roles, part types,
//! texts and tool states), never by the fields import rewrites.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::{json, Value};

use super::{Env, Exported};
use crate::encode::sha256_hex;
use crate::errors::{Code, ToolError, ToolResult};
use crate::opencode::Opencode;

/// The digest both copies are compared by: message and part ids, roles, part types,
/// texts and tool states, in id order. Not the project or directory, which import rewrites.
pub fn canonical_digest(messages: &[Value]) -> String {
    let mut canon: Vec<Value> = messages
        .iter()
        .map(|m| {
            let info = &m["info"];
            let mut parts: Vec<Value> = m["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    json!({
                        "id": p["id"], "type": p["type"], "text": p.get("text").cloned().unwrap_or(Value::Null),
                        "tool": p.get("tool").cloned().unwrap_or(Value::Null),
                        "status": p.get("state").and_then(|s| s.get("status")).cloned().unwrap_or(Value::Null),
                    })
                })
                .collect();
            parts.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            json!({ "id": info["id"], "role": info["role"], "parts": parts })
        })
        .collect();
    canon.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    sha256_hex(&serde_json::to_vec(&canon).expect("serialises"))
}

/// The message ids of one exported session.
pub(super) fn message_ids(session: &Value) -> BTreeSet<&str> {
    session["messages"].as_array().into_iter().flatten().filter_map(|m| m["info"]["id"].as_str()).collect()
}

/// Whether the laptop's copy of a session holds every message of the guest's, identical.
/// Only the guest's messages are compared: messages the user added on the laptop after an
/// earlier harvest (continuing the session there) are theirs, and stay.
///
/// A guest message that differs from the laptop's copy passes only where the laptop's copy
/// is the one an earlier proof of this session proved (`proven`, that proof's stored
/// export): the guest's agent changed its own history since (its OpenCode data is its to
/// edit), or an earlier export held what the guest no longer does. OpenCode's import keeps
/// a message it has, so the laptop keeps what it proved, and without this every later
/// harvest failed the same way and its files never came home. Returns the proven copies of
/// those messages: what the laptop holds in their place, and so what the new proof proves.
fn holds(back: &Value, s: &Exported, proven: Option<&Value>) -> Result<Vec<Value>, String> {
    let theirs = message_ids(&s.json);
    let laptop: BTreeMap<&str, &Value> = back["messages"].as_array().into_iter().flatten().filter_map(|m| Some((m["info"]["id"].as_str().filter(|id| theirs.contains(id))?, m))).collect();
    let msgs: Vec<Value> = laptop.values().map(|m| (*m).clone()).collect();
    let digest = canonical_digest(&msgs);
    let failed = || format!("session {}: the guest has {} messages, the laptop's copy {} of them (digests {} vs {})", s.id, s.messages, msgs.len(), &s.digest[..12], &digest[..12]);
    let mut kept = Vec::new();
    if msgs.len() as u64 != s.messages {
        return Err(failed());
    }
    if digest != s.digest {
        let one = |m: &Value| canonical_digest(core::slice::from_ref(m));
        let proven: BTreeMap<&str, &Value> = proven.map(|p| p["messages"].as_array().into_iter().flatten().filter_map(|m| Some((m["info"]["id"].as_str()?, m))).collect()).unwrap_or_default();
        for m in s.json["messages"].as_array().into_iter().flatten() {
            let id = m["info"]["id"].as_str().unwrap_or_default();
            let Some(here) = laptop.get(id).map(|l| one(l)) else { return Err(failed()) };
            if here == one(m) {
                continue;
            }
            match proven.get(id) {
                Some(p) if one(p) == here => kept.push((*p).clone()),
                _ => return Err(failed()),
            }
        }
    }
    if s.parent.is_some() && back["info"]["parentID"].as_str() != s.parent.as_deref() {
        return Err(format!("session {} lost its parent on import", s.id));
    }
    Ok(kept)
}

/// `opencode import` of a stored export, then the proof: the laptop's own copy, read back,
/// holds the guest's. A failed import is forgiven only when the copy holds it anyway
/// (another harvest of this work, at once, imported the same messages: the transcript is
/// home either way). `proven`: the stored export and digest of this session's last proof,
/// read only when the copies differ (`holds`). Returns the proven copies the laptop keeps
/// of guest messages changed since they were proven.
pub(super) fn import_checked(env: &mut Env, file: &str, s: &Exported, directory: &str, proven: Option<(&str, &str)>) -> ToolResult<Vec<Value>> {
    let mut opencode = Opencode::new(&mut env.programs);
    let imported = opencode.import(file, &s.id, directory);
    let back = match opencode.export(&s.id, directory) {
        Ok(back) => back,
        Err(e) => return Err(imported.err().unwrap_or(e)),
    };
    let checked = holds(&back, s, None).or_else(|why| {
        // Only the export the ledger stored for that proof, whole: its digest is the proof's.
        let stored = proven.and_then(|(path, digest)| {
            let v: Value = serde_json::from_slice(&env.files.read(path).ok().flatten()?).ok()?;
            (canonical_digest(v["messages"].as_array()?) == digest).then_some(v)
        });
        stored.map_or(Err(why.clone()), |v| holds(&back, s, Some(&v)).map_err(|_| why))
    });
    checked.map_err(|why| imported.err().unwrap_or_else(|| ToolError::new(Code::ProofFailed, why)))
}

/// The session as the laptop holds it: the guest's export with the proven copies the
/// laptop kept (`import_checked`) in place of the guest's changed messages. Stored and
/// digested as the proof, so the next harvest compares against what the laptop holds (a
/// proof of the guest's changed copy failed at the next harvest that brought a new turn).
pub(super) fn as_held(s: &Exported, kept: &[Value]) -> Exported {
    let kept: BTreeMap<&str, &Value> = kept.iter().filter_map(|m| Some((m["info"]["id"].as_str()?, m))).collect();
    let mut json = s.json.clone();
    for m in json["messages"].as_array_mut().into_iter().flatten() {
        if let Some(k) = m["info"]["id"].as_str().and_then(|id| kept.get(id)) {
            *m = (*k).clone();
        }
    }
    let digest = canonical_digest(json["messages"].as_array().map(Vec::as_slice).unwrap_or_default());
    Exported { id: s.id.clone(), parent: s.parent.clone(), messages: s.messages, digest, json }
}
