//! What a guest's agent may do to its own OpenCode data (rewrite a message after it was
//! proven, attach a file by a URL) never strands the work's files on the machine, nor the
//! user's session on the laptop.

use serde_json::json;

use crate::common::*;
use crate::world_lies::{export_lie, LIE_HEAD, LIE_TAIL};

const W1: &str = r#"{"work":"w1"}"#;

/// The guest rewrites its first message after that message was proven, and attaches a
/// laptop path (`file:`) to its second prompt. OpenCode's import keeps the message the
/// laptop has, so the proof failed at every harvest and `result.txt` never came home (the
/// drop then asked for a harvest that could not work); the `file:` URL made every later
/// turn of the session fail on the laptop. Now the laptop keeps the copy it proved, the
/// answer names the rewritten message, the file comes home, the part is inert, the next
/// turn's harvest passes with the rewrite kept, and the work drops once the guest is honest
/// again.
#[test]
fn a_message_the_guest_rewrote_after_its_proof_lets_its_files_come_home() {
    let world = World::new("lies-rewrite");
    world.ok_call("boxd_ensure", W1);
    crate::harvest::run_on(&world, "w1", "first words");
    let sid = world.ok_call("boxd_harvest", W1)["sessions"][0]["id"].as_str().unwrap().to_string();
    let first = crate::harvest::laptop_export(&world, &sid)["messages"][0].clone();
    let first_id = first["info"]["id"].as_str().unwrap().to_string();
    assert_eq!(first["parts"][0]["text"], "first words", "{first:#}");
    crate::harvest::run_on(&world, "w1", &crate::harvest::bash("echo made > result.txt"));

    let lie = format!(
        "{LIE_HEAD}root[\"messages\"][0][\"parts\"][0][\"text\"] = \"REWRITTEN ON THE MACHINE\"\nm = [m for m in root[\"messages\"] if m[\"info\"][\"role\"] == \"user\"][1]\nm[\"parts\"].append({{\"id\": \"prt_2320ffffffffFILEURLPART01\", \"sessionID\": root[\"info\"][\"id\"], \"messageID\": m[\"info\"][\"id\"], \"type\": \"file\", \"mime\": \"image/png\", \"filename\": \"shot.png\", \"url\": \"file:///etc/passwd\"}})\n{LIE_TAIL}"
    );
    export_lie(&world, "oc-w1", "w1", Some(&lie));
    let v = world.ok_call("boxd_harvest", r#"{"work":"w1","files":["result.txt"]}"#);
    assert_eq!(v["sessions"][0]["changedOnGuest"], json!([first_id]), "{v:#}");
    assert_eq!(v["proven"], true, "{v:#}");
    assert_eq!(std::fs::read_to_string(world.laptop.project.join("result.txt")).unwrap(), "made\n");
    let laptop = crate::harvest::laptop_export(&world, &sid);
    assert_eq!(laptop["messages"][0]["parts"][0]["text"], "first words", "the laptop keeps what it proved");
    let file_part = laptop["messages"].as_array().unwrap().iter().flat_map(|m| m["parts"].as_array().unwrap()).find(|p| p["type"] == "file").unwrap().clone();
    assert_eq!((file_part["mime"].as_str(), file_part["url"].as_str()), (Some("text/plain"), Some("data:text/plain;base64,")), "{file_part:#}");
    // The guest keeps its rewrite and takes another turn: the proof is of what the laptop
    // holds, so the next harvest passes too (a proof of the guest's copy failed there).
    crate::harvest::run_on(&world, "w1", "another turn");
    let v = world.ok_call("boxd_harvest", W1);
    assert_eq!((v["proven"].as_bool(), &v["sessions"][0]["changedOnGuest"]), (Some(true), &json!([first_id])), "{v:#}");

    // Honest again: the laptop's copies (the first words, the inert part) are the proven ones.
    export_lie(&world, "oc-w1", "w1", None);
    let v = world.ok_call("boxd_harvest", W1);
    assert_eq!(v["proven"], true, "{v:#}");
    assert_eq!(world.ok_call("boxd_drop", W1)["dropped"], true);
}
